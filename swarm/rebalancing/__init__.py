"""The rebalancer: re-plans from the membership view and moves this node's span
make-before-break. `decide` is the pure core (the decision, over immutable snapshots), and
`policy` the pure rules it applies (the threshold a move must pass, holes, handoffs); `loop`
gathers its inputs, calls it and acts; `housekeeping` republishes speed and load, releases
retired shards and re-measures an idle node. Nothing is imported here, so that importing the
pure core loads no torch."""
