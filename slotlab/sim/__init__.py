"""slotlab simulate: the server's decisions on a paper memory, on a simulated clock (issue 12).

* `memory.SimMemory` - the paper memory with scripted generations and decode accounting;
* `paper_replay.replay_on_paper` - `slotlab replay --memory paper`;
* `speed.SpeedModel` - step time from the batch (calibrated or given);
* `traces` - importers (slotlab trace JSON with arrival times, Mooncake JSONL);
* `simulate.simulate` - the event-driven run and its report;
* `fastforward.FastForward` - k generation-only steps at once, with the decisions of k steps;
* `whatif` - a grid of simulations over flag values (`python -m slotlab.sim.whatif`, `main(argv)`)."""
