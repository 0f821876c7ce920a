"""`frspec tune`: measure this machine and these models, predict every draft configuration, confirm the best few
with a short bench, pick the measured best (search.py); the chain-length cost model `generate` uses (cost_model.py).

    measure.py     what is measured on the calibration prompts
    predict.py     throughput predicted from those measurements
    search.py      measure -> predict -> confirm -> pick
    report.py      the tables (Markdown) and the JSON record
    cost_model.py  a target's forward cost against rows, and the chain length that curve favours
"""
