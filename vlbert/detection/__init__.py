"""RoI detection: the Faster R-CNN (C4 backbone, C5 head) and extraction of RoI features."""
