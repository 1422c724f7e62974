"""The operations: one module per stage, each a few functions of a connection that return data.

bootstrap, check, data (prepare-data, extract, make-verifier), inspect_data, train, evaluate,
fetch, regenerate, pipeline (and the demo), plan (the stages measured on a sample, priced),
wheelhouse, jobs (detached jobs on a host). They use
the host layer (specops.host) and never print: specops.views renders what they return.
"""
