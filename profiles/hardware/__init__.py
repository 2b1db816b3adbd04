"""Hardware presets as YAML files (data only); see simulator.hardware."""
