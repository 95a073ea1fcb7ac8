"""How requests and answers travel: Celery and kombu on Redis or RabbitMQ, the result backend."""
