"""Operating the service: health, inspection, worker processes and their supervisor."""
