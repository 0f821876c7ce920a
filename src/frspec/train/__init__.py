"""Training EAGLE-1/2 draft heads for a target: collect its hidden states, fit a head, write it for the loader."""
