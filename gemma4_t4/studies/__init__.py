"""Studies on the user's own GPU that start servers and run the benchmark: tune, drafters, TTFT route."""
