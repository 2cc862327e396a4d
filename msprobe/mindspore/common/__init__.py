"""``msprobe.mindspore.common`` (the documented home of ``utils.MsprobeStep``)."""
