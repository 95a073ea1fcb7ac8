"""Configuration: the ``queues.yml`` schema, the ``DATASERVICE_*`` settings, the budget."""
