"""``dataservice conformance``: a caller in any language checked against the
service (docs/conformance.md).

- :mod:`.interface`: the JSON-lines interface's lines, shared by the runner and
  the Python adapter;
- :mod:`.program`: the caller program, driven over its standard input and output;
- :mod:`.fleet`: the runner's service: configuration, keys, workers, and what it
  reads of them (the database, the workers' counters, the answers' channels);
- :mod:`.cases`: the cases and their checks;
- :mod:`.cli`: the command;
- :mod:`.adapter`: the Python clients as a caller program
  (``python -m dataservice_tools.conformance.adapter``).

The command reaches ``dataservice`` through the entry-point group
``dataservice.commands`` (this package's ``pyproject.toml``).
"""
