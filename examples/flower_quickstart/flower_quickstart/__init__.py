"""A Flower app written against Flower's own API only: it runs with `flwr run` as with the emulator."""
