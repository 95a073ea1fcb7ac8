"""What the tests and the benchmarks share: processes to run the service as, load
to send it, and ways to measure what it did. A module per concern:

- :mod:`~dataservice_tools.testkit.replicas`: interactive worker replicas,
  started and known to answer;
- :mod:`~dataservice_tools.testkit.bursts`: many concurrent reads released together;
- :mod:`~dataservice_tools.testkit.counting_database`: a private MariaDB that
  counts the service's reads itself;
- :mod:`~dataservice_tools.testkit.openloop`: open-loop reads and their figures;
- :mod:`~dataservice_tools.testkit.flood`: a caller flooding at many times its
  rate beside a steady one;
- :mod:`~dataservice_tools.testkit.freshness`: what a cached reader sees while
  others write, with the change stream healthy, paused and absent;
- :mod:`~dataservice_tools.testkit.sockets`: this process's own TCP connections;
- :mod:`~dataservice_tools.testkit.cpu`: processes' CPU time;
- :mod:`~dataservice_tools.testkit.series`: the one percentile, and a bench's runs
  of one system;
- :mod:`~dataservice_tools.testkit.callers`: closed-loop caller threads and a
  round of them;
- :mod:`~dataservice_tools.testkit.machine`: the machine and versions a run is on;
- :mod:`~dataservice_tools.testkit.waits`: :func:`~dataservice_tools.testkit.waits.eventually`,
  the one wait on a condition.

The service never imports it.
"""
