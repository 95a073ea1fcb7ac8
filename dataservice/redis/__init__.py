"""Redis plumbing: where a URL leads (one server, or a Sentinel-managed primary),
every key's name, bounded connections, TLS, packed commands, Lua scripts."""

from __future__ import annotations

from dataservice.redis.endpoints import where

__all__ = ["where"]
