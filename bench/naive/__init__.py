"""The naive baseline for ``dataservice loadtest --system naive``: see app.py."""
