"""`corescale serve`: the deployment bundle and the HTTP service that runs it (docs/deploy.md)."""
