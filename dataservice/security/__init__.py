"""Who may ask for what: request signatures and allowlists, caller keys, Redis users."""
