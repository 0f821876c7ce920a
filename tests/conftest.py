import os

# No model hub is reachable on CI machines; without this a hub-id lookup retries for most of a minute before failing.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
