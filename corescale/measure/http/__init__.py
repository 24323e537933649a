"""A server measured over HTTP: the trial (endpoint=URL|managed), LoadGen's queries sent as requests, each API's
query and answer, the checks of a running server, the `corescale serve` a managed trial starts, and the contract
that service and its trials share."""
