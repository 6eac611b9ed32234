"""Accuracy at equal memory: the equal-memory arms' schedule (the pilot's learning curve) and how far apart their
mAPs must be to differ (a bootstrap over the val images)."""
