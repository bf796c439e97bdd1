"""FL actors, strategies, local training, data and models. Depends on protocol/ only."""
