"""``dataservice loadtest``: an open-loop load harness for the service and a naive baseline.

The harness starts its own worker replicas (on its own Redis db numbers, its
own database and its own MariaDB user), offers a fixed request rate per lane
from a schedule, and samples the database itself (``information_schema``) to
see how many connections and active statements the service really holds.

Modules: :mod:`.scenarios` (what each scenario offers and does),
:mod:`.environment` (database, Redis, replica processes), :mod:`.sampler`
(the database's view), :mod:`.traffic` (the open-loop generator and the
service adapter), :mod:`.report` (statistics, verdicts, JSON and chart) and
:mod:`.runner` (one run, with the live display).
"""
