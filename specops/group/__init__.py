"""Several hosts at once: the same operations over a group of hosts.

fanout (open, run on each host in parallel, collect outcomes), train (one torchrun node per host),
distcheck (a multi-node launch proven), extract (one shard per host), shards (how rows split).
"""
