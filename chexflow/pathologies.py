"""The 14 ChestX-ray14 pathologies in CheXNet's order, and the paper's per-class test AUROC."""

PATHOLOGIES: tuple[str, ...] = (
    "Atelectasis",
    "Cardiomegaly",
    "Effusion",
    "Infiltration",
    "Mass",
    "Nodule",
    "Pneumonia",
    "Pneumothorax",
    "Consolidation",
    "Edema",
    "Emphysema",
    "Fibrosis",
    "Pleural_Thickening",
    "Hernia",
)
NO_FINDING = "No Finding"

# CheXNet (Rajpurkar et al. 2017, arXiv 1711.05225, Table 2), test-set AUROC per class.
CHEXNET_AUROC: dict[str, float] = dict(
    zip(
        PATHOLOGIES,
        (
            0.8094,
            0.9248,
            0.8638,
            0.7345,
            0.8676,
            0.7802,
            0.7680,
            0.8887,
            0.7901,
            0.8878,
            0.9371,
            0.8047,
            0.8062,
            0.9164,
        ),
        strict=True,
    )
)
CHEXNET_MEAN_AUROC = 0.841
