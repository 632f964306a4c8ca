"""Vertical resource recommendations: the Kubernetes VPA recommender's model, without I/O.

`histogram` holds the (decaying) histograms and their checkpoint form, `model` the per-container
aggregate that samples and OOM events feed, `recommender` the estimators and policy capping, and
`spec` the VerticalPodAutoscaler spec.
"""
