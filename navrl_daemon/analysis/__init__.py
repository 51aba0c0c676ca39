"""What is read off a run or a policy after the fact: policy probes, drone-by-drone
comparisons, learning-curve spans and the HTML report. Commands and benchmarks use it;
the training core (pipeline, stages, runtime, storage, rl, env) never imports it."""
