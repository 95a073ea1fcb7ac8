"""Redis plumbing: every key's name, bounded connections, TLS, packed commands, Lua scripts."""
