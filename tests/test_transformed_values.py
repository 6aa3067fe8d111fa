"""What a transformation's value (mg.grad's box, a dual number, mg.vmap's batch) or a
graph node answers where a tensor would: PyTorch's attributes, formatting, and errors that
name the call the user wrote. Oracles: torch.func's wrapped tensors, closed forms."""

import numpy as np
import pytest

import minigraph as mg
from minigraph.errors import GradientError, MinigraphError, ShapeError
from minigraph.graph.graph import GraphError

torch = pytest.importorskip("torch")

TRANSFORMS = {"grad": lambda f: mg.grad(f), "forward": lambda f: mg.grad(f, mode="forward"),
              "vmap": lambda f: mg.vmap(f)}


@pytest.mark.parametrize("name", sorted(TRANSFORMS))
def test_a_transformations_value_has_no_gradient_of_its_own(name):
    """x.requires_grad and x.grad raised AttributeError inside a transformation;
    torch.func's wrapped tensors answer False and None."""
    seen = []

    def f(x):
        seen.append((x.requires_grad, x.grad))
        return mg.sum(x * x)
    TRANSFORMS[name](f)(mg.tensor([1.0, 2.0]))
    assert seen and all(s == (False, None) for s in seen)


@pytest.mark.parametrize("name", sorted(TRANSFORMS))
def test_backward_inside_a_transformation_is_refused_naming_what_to_use(name):
    """loss.backward() inside mg.grad or mg.vmap raised AttributeError; torch.func
    refuses it too, and says to use its grad."""
    def f(x):
        loss = mg.sum(x * x)
        loss.backward()
        return loss
    with pytest.raises(GradientError, match="backward\\(\\) of .*mg.grad or mg.vjp"):
        TRANSFORMS[name](f)(mg.tensor([1.0, 2.0]))


@pytest.mark.parametrize("name", ["grad", "forward"])
def test_a_value_inside_mg_grad_formats_its_number(name):
    """f"{loss:.3f}" raised TypeError on a box or a dual number, whose value answers
    float(): 1 + 4 = 5 (closed form)."""
    shown = []

    def f(x):
        loss = mg.sum(x * x)
        shown.append(f"{loss:.3f}")
        return loss
    TRANSFORMS[name](f)(mg.tensor([1.0, 2.0]))
    assert set(shown) == {"5.000"}


def test_a_batched_value_refuses_a_format_spec_as_it_refuses_float():
    def f(x):
        return mg.sum(x * x) if f"{mg.sum(x):.2f}" else x
    with pytest.raises(MinigraphError, match="vmap: float\\(\\) of a batched value"):
        mg.vmap(f)(mg.tensor([[1.0, 2.0]]))


def test_scatter_add_with_a_batched_index_names_itself():
    """The refusal spoke of np.asarray(), which the user never called."""
    with pytest.raises(ShapeError, match="scatter_add: an index must be .*under vmap"):
        mg.vmap(lambda g, i: mg.scatter_add(g, (i,), (3,)))(np.arange(2.0), np.array([0, 2]))


def test_gradients_of_a_batched_value_in_a_graph_names_the_transformation():
    """It said to build inside mg.Graph(), where the call already was."""
    with mg.Graph():
        x = mg.placeholder((2, 3), name="x")
        with pytest.raises(GraphError, match="a vmap example: mg.gradients differentiates"):
            mg.vmap(lambda v: mg.gradients(mg.sum(v * v), [v]))(x)


@pytest.mark.parametrize("batched", [False, True])
def test_nll_loss_grad_checks_its_labels_by_its_own_name(batched):
    """Float labels gave NumPy's IndexError, or under vmap an error naming one_hot."""
    g, labels = mg.tensor(1.0), mg.tensor([[0.0, 1.0]] if batched else [0.0, 1.0])
    call = mg.vmap(lambda lab: mg.nll_loss_grad(g, lab, 3)) if batched else \
        (lambda lab: mg.nll_loss_grad(g, lab, 3))
    with pytest.raises(TypeError, match="nll_loss_grad: labels must be integers"):
        call(labels)
    if batched:
        with pytest.raises(IndexError, match="nll_loss_grad: label 5 .* out of range"):
            call(mg.tensor([[0, 5]]))
