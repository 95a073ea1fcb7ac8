"""What the service tells its operators about itself, beside the metrics'
definitions (:mod:`dataservice.observe.metrics`): each request's trace through the
stages (:mod:`.trace`), its log line (:mod:`.requestlog`, written in batches by
:mod:`.lines`), and the log format of every process (:mod:`.logs`)."""
