"""The Celery side: the app, the task, and the per-lane worker pools that run
:mod:`dataservice.handler`'s request path (which knows nothing of Celery)."""
