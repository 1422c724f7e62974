"""The host layer: one connection to one host and what travels over it.

transport (the connection's API: run, read, put, sync, dry-run, notes), ssh and local (its two
transports), connection (connect()), hostkeys (strict known_hosts), remote_exec (the one door to
a host script, with the venv's interpreter), push (specops_host/ kept in sync), transfer (pull-back and
upload over several streams). Nothing here knows a stage of the pipeline.
"""
