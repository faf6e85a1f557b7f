"""One module per CLI command; each imports only typer/typing at module level."""
