"""gpufed's node pools: validated pool specs, Pulumi programs, provisioners and capacity decisions.

The public API, for the federation's capacity reconciler (see docs/iac.md):

- `iac.pools`: `PoolSpec`, `validate`, `ProviderConfig`, the node labels;
- `iac.api`: the `Provisioner` protocol and its values (`ChangePreview`, `ChangeResult`,
  `PoolStatus`, `PendingOperation`), `usd_per_hour`; `iac.errors`: the error tree;
- `iac.automation.PulumiProvisioner`, `iac.simulated.SimulatedProvisioner`,
  `iac.memory.InMemoryProvisioner`; `iac.resize.PoolResizer` with `iac.sim_http.HttpPoolResizer`;
- `iac.decide.decide` and `iac.plans` (pure): pool changes from capacity requests, plans and limits.

`iac.programs` imports the Pulumi provider SDKs (slow to import); nothing here imports it eagerly.
"""
