"""What the service tells its operators about itself: its metrics
(:mod:`.metrics`), each request's trace through the stages (:mod:`.trace`),
its log line (:mod:`.requestlog`, written in batches by :mod:`.lines`), and
the log format of every process (:mod:`.logs`)."""
