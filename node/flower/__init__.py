"""Flower apps under the emulator: an unmodified ServerApp and ClientApp run in the server and
host processes, their messages travel as real bytes through this project's codecs and the
emulated network. Needs the optional extra `flower` (flwr); nothing here imports it at module
level, so the rest of the project never does."""
