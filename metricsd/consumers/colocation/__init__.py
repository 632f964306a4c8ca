"""The colocation lending plan: which whole nodes of a pool online services can lend to offline work,
when, and how they come back (`machine`: the per-node state machine, `forecast`: online demand by
hour, `planner`: the decisions, `spec`: the ColocationPlan document, `controller`: the loop)."""
