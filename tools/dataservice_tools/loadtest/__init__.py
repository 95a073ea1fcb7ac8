"""``dataservice loadtest``: an open-loop load harness for the service and a naive baseline.

The harness starts its own worker replicas (on its own Redis db numbers, its
own database and its own MariaDB user), offers a fixed request rate per lane
from a schedule, and samples the database itself (``information_schema``) to
see how many connections and active statements the service really holds.

Modules: :mod:`.scenarios` (what each scenario offers and does), :mod:`.changes` and
:mod:`.streamwatch` (the change consumer, direct writes, lag and cache hits of a
scenario that reads through the cache),
:mod:`.environment` (database, Redis, replica processes), :mod:`.sampler`
and :mod:`.probe` (the database's view, sampled by a process of its own),
:mod:`.faults` and :mod:`.invariants` (the faults injected and what a fault
run must show), :mod:`.liveness` (the replicas' health check over the
run), :mod:`.openloop` (the open-loop generator and the outcome of each
request), :mod:`.service` and :mod:`.naive` (the two systems under test: how
to call them; the baseline's workers too), :mod:`.incidents` and :mod:`.delay`
(the incident scenarios' timeouts, and the database slowed down under running
workers), :mod:`.runner` (one run: set-up, capacity, its
measured part and events), :mod:`.report` (statistics and JSON),
:mod:`.recovery` (goodput back after an incident), :mod:`.findings` (the report
and its verdicts), :mod:`.display` (the live and summary tables) and
:mod:`.chart` (the PNG, drawn with the ``loadtest`` extra's matplotlib).
"""
