"""The core: batches, the dataflow substrate, workers, operators, policies."""
