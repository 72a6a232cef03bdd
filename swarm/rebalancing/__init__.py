"""The rebalancer: re-plans from the membership view and moves this node's span
make-before-break. `decide` is the pure core (every rule, over immutable snapshots); `loop`
gathers its inputs, calls it and acts; `housekeeping` republishes speed and load, releases
retired shards and re-measures an idle node. Nothing is imported here, so that importing the
pure core loads no torch."""
