"""Celery side of dataservice: the app, the task, and the per-lane worker pools."""
