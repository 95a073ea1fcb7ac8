"""The read cache in Redis (``docs/cache.md``): a record's cached formats, how they
are stored, and the reads and fills that use them."""
