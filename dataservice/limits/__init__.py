"""What keeps each caller, each lane and each replica within its bounds.

- :mod:`.gcra` and ``gcra.lua``: the rate algorithm, once in Python, once in Lua.
- :mod:`.gate` (``gate.lua``) and :mod:`.local`: per-caller replay memory, rate
  and in-flight cap, shared in Redis, with this replica's share as fallback.
- :mod:`.admission` (``admit.lua``): a lane queue's bounds and the caller's
  pace, at publish.
- :mod:`.permits`: database permits per lane and operation class, per replica.
"""
