"""``vision.analyze`` delegate: image facts from Pillow (a real vision model is a provider's job).

Input ``{path (absolute), prompt?}``; answer ``{width, height, mode, format, dominantColors:
[{rgb: [r, g, b], hex, share}], exif: {tag: value}, engine, promptIgnored}``. Dominant colours
come from an adaptive palette of at most 8 colours on a thumbnail, largest share first.
"""

from __future__ import annotations

from typing import Any

from sidecars.media.delegates._oneshot import DelegateError, main

PALETTE = 8
THUMB = (256, 256)


def _exif(image: Any) -> dict[str, str]:
    from PIL import ExifTags

    out: dict[str, str] = {}
    for tag, value in image.getexif().items():
        name = ExifTags.TAGS.get(tag, str(tag))
        text = value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
        out[name] = text[:200]
    return out


def analyze(payload: dict[str, Any], _request: dict[str, Any]) -> dict[str, Any]:
    """Describe one image: size, mode, format, dominant colours, EXIF."""
    path = payload.get("path")
    if not isinstance(path, str):
        raise DelegateError("input.path must be a string")
    try:
        from PIL import Image, UnidentifiedImageError
    except ImportError:
        raise DelegateError(
            "Pillow is not installed; pip install Pillow (toolhost extra 'media')",
            code="unavailable",
            engine="Pillow",
        ) from None
    try:
        image = Image.open(path)
    except UnidentifiedImageError:
        raise DelegateError("not an image Pillow can read", code="unsupported") from None
    with image:
        facts: dict[str, Any] = {
            "width": image.width,
            "height": image.height,
            "mode": image.mode,
            "format": image.format,
            "exif": _exif(image),
        }
        thumb = image.convert("RGB")
        thumb.thumbnail(THUMB)
    quantized = thumb.quantize(colors=PALETTE)
    palette = quantized.getpalette() or []
    counts = sorted(quantized.getcolors(PALETTE) or [], reverse=True)
    total = sum(count for count, _ in counts) or 1
    colors = []
    for count, index in counts:
        start = 3 * int(index)  # type: ignore[call-overload]  # P mode: a palette index
        rgb = palette[start : start + 3]
        colors.append(
            {
                "rgb": rgb,
                "hex": "#{:02x}{:02x}{:02x}".format(*rgb),
                "share": round(count / total, 4),
            }
        )
    facts["dominantColors"] = colors
    facts["engine"] = "Pillow"
    facts["promptIgnored"] = bool(payload.get("prompt"))
    return facts


if __name__ == "__main__":
    main(analyze)
