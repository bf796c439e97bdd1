"""A user's own components for fl-emulator, named in a scenario by import path:

    task.model: custom_components.model:small_mlp
    task.dataset: custom_components.data:mnist_subset
    algorithm.name: custom_components.strategy:TrimmedMean
    selection.policy: custom_components.selection:RoundRobin

Install with `pip install -e examples/custom_components` and run `scenario.yaml` beside this package."""
