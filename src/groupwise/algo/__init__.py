"""Pure GRPO/DAPO maths: the zero-variance filter, reward scaling and shaping, baselines and advantages,
the step tally, the step sizes, the sync dynamic-sampling accumulator, and the policy loss. No I/O, no config
import. Import the modules themselves: the package imports nothing, so the config and the simulator can use the
torch-free modules (filter, tally, step sizes, accumulator, the loss menu) without loading torch for the loss."""
