"""Figures: each module measures one Leasehold figure and the baseline it is divided by."""
