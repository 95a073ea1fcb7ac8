"""The change stream: every committed change to a record, read from the
database's binlog, invalidates both cache formats (``docs/changes.md``)."""
