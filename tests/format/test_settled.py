"""msprobe.format.settled: a module's parameters_grad record accumulated over several backward passes
is placed where its content was settled (after the module's last backward record); others stay."""
from __future__ import annotations

from msprobe.format.settled import settled_order, settled_positions

#: ours on a 2-micro-batch pipeline stage: each module's one parameters_grad record sits at
#: micro-batch 0's backward, its statistics those of the gradient after micro-batch 1's
PIPELINE = ["Module.l1.Linear.forward.0", "Module.l2.Linear.forward.0", "Module.l1.Linear.forward.1",
            "Module.l2.Linear.forward.1", "Functional.linear.1.backward", "Module.l2.Linear.parameters_grad",
            "Module.l2.Linear.backward.0", "Module.l1.Linear.backward.0", "Module.l1.Linear.parameters_grad",
            "Tensor.fmod.3.forward", "Functional.linear.3.backward", "Module.l2.Linear.backward.1",
            "Module.l1.Linear.backward.1", "Functional.linear.2.backward"]


def test_an_accumulated_gradient_moves_after_its_modules_last_backward():
    assert settled_positions(PIPELINE) == {5: 11.5, 8: 12.5}
    order = settled_order(PIPELINE)
    assert [PIPELINE[i] for i in order][7:] == [
        "Tensor.fmod.3.forward", "Functional.linear.3.backward", "Module.l2.Linear.backward.1",
        "Module.l2.Linear.parameters_grad", "Module.l1.Linear.backward.1", "Module.l1.Linear.parameters_grad",
        "Functional.linear.2.backward"]


def test_one_backward_or_one_record_per_backward_keeps_the_place():
    single = ["Module.fc.Linear.forward.0", "Functional.linear.0.backward", "Module.fc.Linear.parameters_grad",
              "Module.fc.Linear.backward.0", "Tensor.add.0.forward"]
    assert settled_positions(single) == {} and settled_order(single) == list(range(5))
    # 26.2.0 on the same pipeline: one counted record per backward, each written as its gradient arrives
    counted = ["Module.l2.Linear.parameters_grad.0", "Module.l2.Linear.backward.0", "Tensor.fmod.3.forward",
               "Module.l2.Linear.parameters_grad.1", "Module.l2.Linear.backward.1"]
    assert settled_positions(counted) == {}
    # a MindSpore cell alike; an API's backward is no module's
    cells = ["Cell.fc.Dense.parameters_grad", "Cell.fc.Dense.backward.0", "Cell.fc.Dense.backward.1"]
    assert settled_positions(cells) == {0: 2.5}
    assert settled_positions(["Module.a.L.parameters_grad", "Functional.a.0.backward", "Functional.a.1.backward"]) == {}
