"""torchvision beyond classification (the zoo has every classification model): detection (Faster and Mask R-CNN,
keypoint R-CNN, RetinaNet, FCOS, SSDlite: torchvision's own roi_align and nms ops, data-dependent proposals and
matching), segmentation (DeepLabV3, FCN, LR-ASPP), video (R(2+1)D) and optical flow (RAFT: correlation volumes,
grid sampling, iterative refinement). Small images and batches, random weights."""
import torch
import torch.nn.functional as F

from .harness import std_step

SIDE = 128


def _targets(n, masks=False, keypoints=False):
    targets = []
    for i in range(n):
        boxes = torch.tensor([[8.0 + 4 * i, 10.0, 60.0, 70.0], [40.0, 30.0, 110.0, 100.0 - 3 * i]])
        t = {"boxes": boxes, "labels": torch.tensor([1, 1]) if keypoints else torch.tensor([1, 2 + i % 3])}
        if masks:
            m = torch.zeros(2, SIDE, SIDE, dtype=torch.uint8)
            m[0, 10:70, 8:60] = 1
            m[1, 30:95, 40:110] = 1
            t["masks"] = m
        if keypoints:
            t["keypoints"] = torch.tensor([[[20.0, 30.0, 1.0]] * 17, [[60.0, 50.0, 1.0]] * 17])
        targets.append(t)
    return targets


def detection(name, batch=2, **kw):
    def build():
        import torchvision
        if not name.startswith("ssd"):  # SSD resizes to its own fixed size
            kw.update(min_size=SIDE, max_size=SIDE)
        m = torchvision.models.get_model(name, weights=None, weights_backbone=None, **kw)
        m.train()
        images = [torch.rand(3, SIDE, SIDE) for _ in range(batch)]
        targets = _targets(batch, masks="mask" in name, keypoints="keypoint" in name)
        return m, torch.optim.SGD(m.parameters(), 0.01, momentum=0.9), (images, targets)

    def loss(m, d):
        return sum(m(d[0], d[1]).values())
    return build, std_step(loss)


def segmentation(name, batch=4):
    def build():
        import torchvision
        m = torchvision.models.get_model(name, weights=None, weights_backbone=None, num_classes=5)
        m.train()
        return m, torch.optim.SGD(m.parameters(), 0.01, momentum=0.9), (
            torch.rand(batch, 3, SIDE, SIDE), torch.randint(0, 5, (batch, SIDE, SIDE)))

    def loss(m, d):
        out = m(d[0])
        return F.cross_entropy(out["out"], d[1]) + (F.cross_entropy(out["aux"], d[1]) if "aux" in out else 0)
    return build, std_step(loss)


def video_build():
    import torchvision
    m = torchvision.models.get_model("r2plus1d_18", weights=None, num_classes=10)
    return m, torch.optim.SGD(m.parameters(), 0.01), (torch.rand(2, 3, 8, 64, 64), torch.randint(0, 10, (2,)))


def raft_build():
    import torchvision
    m = torchvision.models.get_model("raft_small", weights=None)
    m.train()
    return m, torch.optim.AdamW(m.parameters(), 1e-4), (torch.rand(2, 3, SIDE, SIDE), torch.rand(2, 3, SIDE, SIDE),
                                                         torch.randn(2, 2, SIDE, SIDE))


def raft_loss(m, d):
    flows = m(d[0], d[1], num_flow_updates=4)
    return sum((f - d[2]).abs().mean() * 0.8 ** (len(flows) - 1 - i) for i, f in enumerate(flows))


PROGRAMS = {
    "tv_fasterrcnn_mobilenet": detection("fasterrcnn_mobilenet_v3_large_320_fpn", num_classes=5),
    "tv_maskrcnn": detection("maskrcnn_resnet50_fpn", num_classes=5, trainable_backbone_layers=5),
    "tv_keypointrcnn": detection("keypointrcnn_resnet50_fpn", num_classes=2, trainable_backbone_layers=5),
    "tv_retinanet": detection("retinanet_resnet50_fpn", num_classes=5, trainable_backbone_layers=5),
    "tv_fcos": detection("fcos_resnet50_fpn", num_classes=5, trainable_backbone_layers=5),
    "tv_ssdlite": detection("ssdlite320_mobilenet_v3_large", batch=4, num_classes=5),
    "tv_deeplabv3": segmentation("deeplabv3_mobilenet_v3_large"),
    "tv_fcn": segmentation("fcn_resnet50", batch=2),
    "tv_lraspp": segmentation("lraspp_mobilenet_v3_large"),
    "tv_r2plus1d": (video_build, std_step(lambda m, d: F.cross_entropy(m(d[0]), d[1]))),
    "tv_raft_small": (raft_build, std_step(raft_loss)),
}

# A minute or more each on 2 cores: `make ecosystem` runs them, `make test` only the two others.
SLOW = set(PROGRAMS) - {"tv_raft_small", "tv_lraspp"}
