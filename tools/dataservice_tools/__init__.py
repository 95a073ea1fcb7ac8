"""dataservice's tooling: the load harness, the demo, the private-service starter and
the test kit (what the tests and the benchmarks share).

Installed beside the service for development and load runs; the runtime wheel does not carry it.
"""
