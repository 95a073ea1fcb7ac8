"""dataservice's tooling: the load harness, the demo and the private-service starter.

Installed beside the service for development and load runs; the runtime wheel does not carry it.
"""
