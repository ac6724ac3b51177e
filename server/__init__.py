"""calor.server."""
