"""torchvision's detection, segmentation, video and optical-flow models against their published
``_ops`` (GFLOPS, which are MACs) and ``num_params`` (issue 12).

Inputs that reproduce the published figures (found by trying; torchvision's metadata does not
record them):

* video: 16 frames at the weights' crop size, (1, 3, 16, 112, 112) for r3d/mc3/r2plus1d and
  (1, 3, 16, 224, 224) for s3d, mvit and swin3d;
* segmentation: (1, 3, 520, 520) (the transforms' resize size), with the auxiliary classifier
  (``aux_loss=True``: the weights have one, and it runs in eval);
* optical flow: two (1, 3, 512, 512) frames;
* detection: one 3 x 224 x 224 image, which the model's transform resizes (800 x 800 for the
  R-CNNs, RetinaNet and FCOS; 300 / 320 for SSD / SSDlite; 320 for the ``_320_fpn`` model).
  Built as the published weights build them: ``FrozenBatchNorm2d`` in the backbone (its affine
  terms are buffers, not parameters), which is what ``num_params`` counts.

Detection is data-dependent and is counted as a real forward with ``weights=None``. Four
published figures depend on how many proposals or detections the trained weights produced on
torchvision's measurement image, which its metadata does not record: the Faster R-CNN MobileNet
models' RPN (score threshold 0.05) passed none, Mask R-CNN v1 found no detection (its mask
branch ran on none), Keypoint R-CNN found one. Those counts are set on the random-weights model
(``PUBLISHED_RUN``) and the whole forward then equals the published figure exactly.

Shape-deterministic models run on the ``meta`` device (no arithmetic); the default tier takes a
fast subset, ``FLOPSCOPE_SLOW=1`` the rest.
"""

from __future__ import annotations

import os
import warnings
from typing import Any

import pytest
import torch

import flopscope

torchvision = pytest.importorskip("torchvision")
from torchvision.models import get_model, get_model_weights  # noqa: E402
from torchvision.ops.misc import FrozenBatchNorm2d  # noqa: E402

_RUN_SLOW = bool(os.environ.get("FLOPSCOPE_SLOW"))


def slow(name: str) -> Any:
    return pytest.param(name, marks=[pytest.mark.slow, pytest.mark.skipif(
        not _RUN_SLOW, reason="slow tier: set FLOPSCOPE_SLOW=1")])


def _meta(name: str) -> dict[str, Any]:
    return dict(get_model_weights(name).DEFAULT.meta)


def _count(model: torch.nn.Module, *args: Any) -> flopscope.Report:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return flopscope.count(model, *args)


def _gmacs(macs: int) -> float:
    return round(macs / 1e9, 3)


VIDEO = {"r3d_18": 112, "mc3_18": 112, "r2plus1d_18": 112, "s3d": 224, "mvit_v1_b": 224,
         "mvit_v2_s": 224, "swin3d_t": 224, "swin3d_s": 224, "swin3d_b": 224}
SEGMENTATION = ["fcn_resnet50", "fcn_resnet101", "deeplabv3_resnet50", "deeplabv3_resnet101",
                "deeplabv3_mobilenet_v3_large", "lraspp_mobilenet_v3_large"]


@pytest.mark.parametrize("name", ["r3d_18", "s3d", "mvit_v2_s", "swin3d_t",
                                  *(slow(n) for n in VIDEO if n not in
                                    ("r3d_18", "s3d", "mvit_v2_s", "swin3d_t"))])
def test_video(name: str) -> None:
    size = VIDEO[name]
    with torch.device("meta"):
        model = get_model(name, weights=None).eval()
    report = _count(model, torch.empty(1, 3, 16, size, size, device="meta"))
    meta = _meta(name)
    assert _gmacs(report.macs) == meta["_ops"]
    assert report.params == meta["num_params"]
    assert report.uncounted == {}


@pytest.mark.parametrize("name", ["fcn_resnet50", "lraspp_mobilenet_v3_large",
                                  *(slow(n) for n in SEGMENTATION[1:] if n != "lraspp_mobilenet_v3_large")])
def test_segmentation(name: str) -> None:
    kwargs: dict[str, Any] = {"weights_backbone": None}
    if not name.startswith("lraspp"):
        kwargs["aux_loss"] = True
    with torch.device("meta"):
        model = get_model(name, weights=None, **kwargs).eval()
    report = _count(model, torch.empty(1, 3, 520, 520, device="meta"))
    meta = _meta(name)
    assert _gmacs(report.macs) == meta["_ops"]
    assert report.params == meta["num_params"]
    assert report.uncounted == {}


@pytest.mark.parametrize("name", ["raft_small", slow("raft_large")])
def test_optical_flow(name: str) -> None:
    with torch.device("meta"):
        model = get_model(name, weights=None).eval()
    frame = torch.empty(1, 3, 512, 512, device="meta")
    report = _count(model, frame, frame)
    meta = _meta(name)
    assert _gmacs(report.macs) == meta["_ops"]
    assert report.params == meta["num_params"]
    assert report.uncounted == {}


def _detector(name: str) -> torch.nn.Module:
    """``name`` with ``weights=None``, its backbone's batch norms frozen as the published weights
    build them (torchvision uses ``FrozenBatchNorm2d`` whenever weights are given)."""
    torch.manual_seed(0)
    model = get_model(name, weights=None, weights_backbone=None).eval()
    if name.startswith("ssd") or name.endswith("_v2"):
        return model  # these keep plain BatchNorm2d with their weights too
    for parent in list(model.backbone.modules()):
        for child_name, child in list(parent.named_children()):
            if type(child) is torch.nn.BatchNorm2d:
                setattr(parent, child_name, FrozenBatchNorm2d(child.num_features, eps=child.eps))
    return model


def _image() -> list[torch.Tensor]:
    return [torch.rand(3, 224, 224, generator=torch.Generator().manual_seed(0))]


# published == our count of the whole forward
EXACT = ["ssdlite320_mobilenet_v3_large", "ssd300_vgg16", "retinanet_resnet50_fpn",
         "fcos_resnet50_fpn", "fasterrcnn_resnet50_fpn", "retinanet_resnet50_fpn_v2",
         "fasterrcnn_resnet50_fpn_v2", "maskrcnn_resnet50_fpn_v2"]


@pytest.mark.parametrize("name", ["ssdlite320_mobilenet_v3_large",
                                  *(slow(n) for n in EXACT[1:])])
def test_detection_exact(name: str) -> None:
    report = _count(_detector(name), _image())
    meta = _meta(name)
    assert _gmacs(report.macs) == meta["_ops"]
    assert report.params == meta["num_params"]
    assert report.uncounted == {}


# The data-dependent count behind each of the other four published figures, as the published run
# (trained weights on torchvision's measurement image) had it, and how to set it on a model with
# random weights: the Faster R-CNN MobileNet models' RPN (rpn_score_thresh=0.05) passed no
# proposal to the box head; Mask R-CNN v1's box head found no detection above 0.05, so the mask
# branch ran on none; Keypoint R-CNN's found one, and the keypoint branch ran on it. Each is the
# only count that matches at torchvision's 3 decimals: one more proposal is 14,359,552 MACs of box
# head and predictor (0.014 GMAC), one more detection 532,066,304 of mask branch (0.532 GMAC: 4
# 3x3 convolutions 256 -> 256 on 14 x 14, the 2x2 transposed convolution, the 1x1 to 91 classes
# on 28 x 28) or 3,495,460,864 of keypoint branch (3.495 GMAC).
PUBLISHED_RUN: dict[str, tuple[str, str, float]] = {
    "fasterrcnn_mobilenet_v3_large_320_fpn": ("rpn", "score_thresh", 1.0),  # 0 proposals
    "fasterrcnn_mobilenet_v3_large_fpn": ("rpn", "score_thresh", 1.0),  # 0 proposals
    "maskrcnn_resnet50_fpn": ("roi_heads", "score_thresh", 1.0),  # 0 detections
    "keypointrcnn_resnet50_fpn": ("roi_heads", "detections_per_img", 1),  # 1 detection
}


def _as_published(name: str) -> torch.nn.Module:
    model = _detector(name)
    module, attribute, value = PUBLISHED_RUN[name]
    setattr(getattr(model, module), attribute, value)
    return model


@pytest.mark.parametrize("name", ["fasterrcnn_mobilenet_v3_large_320_fpn",
                                  slow("fasterrcnn_mobilenet_v3_large_fpn")])
def test_detection_mobilenet_as_published(name: str) -> None:
    # no proposal scores above the RPN's threshold (a probability cannot exceed 1.0): the box
    # head runs on an empty batch, as in the published run, and the whole forward's count is the
    # published figure
    report = _count(_as_published(name), _image())
    meta = _meta(name)
    assert report.by_module()["roi_heads"].inclusive.macs == 0
    assert _gmacs(report.macs) == meta["_ops"]  # 0.719 (320_fpn), 4.494
    assert report.params == meta["num_params"]
    assert report.uncounted == {}


def test_detection_random_weights_send_proposals_to_the_box_head() -> None:
    # why the published MobileNet figures need the threshold: with random weights every anchor's
    # objectness is about sigmoid(0) = 0.5 > 0.05, the RPN keeps its quota of 150 proposals and
    # the box head runs on them: 150 * (256*7*7*1024 + 1024*1024 + 1024*91 + 1024*364)
    # = 150 * 14,359,552 = 2,153,932,800 MACs more than published
    name = "fasterrcnn_mobilenet_v3_large_320_fpn"
    report = _count(_detector(name), _image())
    heads = report.by_module()["roi_heads"].inclusive.macs
    assert heads == 2_153_932_800
    assert _gmacs(report.macs - heads) == _meta(name)["_ops"]


@pytest.mark.parametrize("name", [slow("maskrcnn_resnet50_fpn")])
def test_detection_mask_branch_as_published(name: str) -> None:
    report = _count(_as_published(name), _image())
    meta = _meta(name)
    modules = report.by_module()
    assert modules["roi_heads.mask_head"].inclusive.macs == 0
    # the box head still runs on the RPN's 1,000 proposals: 1,000 * 13,893,632 (TwoMLPHead)
    assert modules["roi_heads.box_head"].inclusive.macs == 13_893_632_000
    assert _gmacs(report.macs) == meta["_ops"] == 134.380
    assert report.params == meta["num_params"]
    assert report.uncounted == {}


@pytest.mark.parametrize("name", [slow("keypointrcnn_resnet50_fpn")])
def test_detection_keypoint_branch_as_published(name: str) -> None:
    report = _count(_as_published(name), _image())
    meta = _meta(name)
    modules = report.by_module()
    # one detection's 14 x 14 RoI through 8 3x3 convolutions (256 -> 512, then 7 x 512 -> 512):
    # 196 * 9 * (256*512 + 7*512*512) = 3,468,165,120 MACs; the predictor's 4x4 stride-2
    # transposed convolution 512 -> 17 scatters each of the 196 inputs into 17*16 outputs:
    # 196 * 512 * 17 * 16 = 27,295,744
    assert modules["roi_heads.keypoint_head"].inclusive.macs == 3_468_165_120
    assert modules["roi_heads.keypoint_predictor"].inclusive.macs == 27_295_744
    assert _gmacs(report.macs) == meta["_ops"] == 137.420
    assert report.params == meta["num_params"]
    assert report.uncounted == {}
