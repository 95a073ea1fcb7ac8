"""What the service tells its operators about itself, beside the metrics'
definitions (:mod:`dataservice.metrics`): each request's trace through the
stages (:mod:`.trace`), its log line (:mod:`.requestlog`), the log format of
every process (:mod:`.logs`) and the gauges a worker reads when scraped
(:mod:`.gauges`)."""
