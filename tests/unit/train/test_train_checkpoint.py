"""strategyjob.train.Checkpoint: what it saves, how it restores, TensorFlow's numbering and
load statuses, and one clear error for each kind of bad input."""

from __future__ import annotations

import copy
import gc
import logging
import os
import weakref

import pytest
import strategyjob as sj
import torch
import torch.nn.functional as F
from strategyjob import errors, train
from strategyjob._variables import MirroredVariable, SyncOnReadVariable
from torch import nn

pytestmark = pytest.mark.timeout(60)


def _build(seed: int) -> tuple[nn.Module, torch.optim.Optimizer, object]:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 3))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    return model, opt, sched


def _train(model, opt, sched, steps: int, gen: torch.Generator) -> None:
    for _ in range(steps):
        x = torch.randn(4, 5, generator=gen)
        y = torch.randint(0, 3, (4,), generator=gen)
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
        sched.step()


def test_round_trip_resumes_bit_identical(tmp_path):
    """Train 3 steps, save, train 3 more; a fresh program restoring the checkpoint and training
    3 steps ends bit-identical: model, optimizer moments, LR schedule, counters and RNG."""
    model, opt, sched = _build(0)
    gen = torch.Generator().manual_seed(1)
    step = torch.tensor(0)
    ckpt = train.Checkpoint(model=model, optimizer=opt, scheduler=sched, step=step, gen=gen)
    ckpt.epoch = 7  # attributes assigned later are tracked too
    _train(model, opt, sched, 3, gen)
    step += 3
    path = ckpt.save(tmp_path / "ckpt")
    _train(model, opt, sched, 3, gen)

    model2, opt2, sched2 = _build(123)  # different initial values
    gen2 = torch.Generator().manual_seed(999)
    step2 = torch.tensor(-1)
    ckpt2 = train.Checkpoint(
        model=model2, optimizer=opt2, scheduler=sched2, step=step2, gen=gen2, epoch=0
    )
    status = ckpt2.restore(path)
    status.assert_consumed().assert_existing_objects_matched().assert_nontrivial_match()
    assert int(step2) == 3 and ckpt2.epoch == 7
    assert int(ckpt2.save_counter) == 1
    assert sched2.last_epoch == 3 and sched2.get_last_lr() == [0.005]
    _train(model2, opt2, sched2, 3, gen2)
    for a, b in zip(model.parameters(), model2.parameters()):
        assert torch.equal(a, b)
    assert sched.get_last_lr() == sched2.get_last_lr()
    assert torch.equal(
        opt.state_dict()["state"][0]["exp_avg"],
        opt2.state[opt2.param_groups[0]["params"][0]]["exp_avg"],
    )


def test_save_numbers_like_tensorflow(tmp_path):
    ckpt = train.Checkpoint(v=torch.zeros(2))
    assert int(ckpt.save_counter) == 0
    assert ckpt.save(str(tmp_path / "p")) == str(tmp_path / "p-1")
    assert ckpt.save(tmp_path / "p") == str(tmp_path / "p-2")
    assert train.latest_checkpoint(tmp_path) == str(tmp_path / "p-2")  # save records it
    assert ckpt.write(tmp_path / "exact") == str(tmp_path / "exact")  # no number, not counted
    assert int(ckpt.save_counter) == 2
    assert train.latest_checkpoint(tmp_path) == str(tmp_path / "p-2")
    assert sorted(os.listdir(tmp_path)) == ["checkpoint", "exact", "p-1", "p-2"]

    fresh = train.Checkpoint(v=torch.zeros(2))
    fresh.read(tmp_path / "p-1")
    assert int(fresh.save_counter) == 1  # the counter is part of the checkpoint
    assert fresh.save(tmp_path / "p") == str(tmp_path / "p-2")


def test_values_restore_in_place_and_python_values_as_attributes(tmp_path):
    t = torch.arange(4.0)
    nested = train.Checkpoint(w=torch.ones(3))
    ckpt = train.Checkpoint(
        t=t, n=3, flag=True, name="a", d={"lr": 0.1, "x": torch.ones(2)}, lst=[1, torch.ones(1)]
    )
    ckpt.inner = nested
    path = ckpt.write(tmp_path / "c")
    t.zero_()
    nested.w.fill_(5.0)
    ckpt.d["x"].zero_()
    ckpt.n, ckpt.flag, ckpt.name, ckpt.d["lr"], ckpt.lst[0] = 0, False, "b", 0.0, 0
    ckpt.restore(path).assert_consumed()
    assert torch.equal(t, torch.arange(4.0)) and ckpt.t is t
    assert torch.equal(nested.w, torch.ones(3))
    assert (ckpt.n, ckpt.flag, ckpt.name, ckpt.d["lr"], ckpt.lst[0]) == (3, True, "a", 0.1, 1)
    assert torch.equal(ckpt.d["x"], torch.ones(2))


def test_variables_and_sharded_variable(tmp_path):
    plain = sj.Variable(torch.tensor([1.0, 2.0]))
    sharded = sj.ShardedVariable([sj.Variable(torch.ones(2, 3)), sj.Variable(torch.ones(1, 3))])
    ckpt = train.Checkpoint(plain=plain, sharded=sharded)
    sharded.assign(torch.arange(9.0).view(3, 3))
    path = ckpt.write(tmp_path / "v")
    plain.assign(torch.zeros(2))
    sharded.assign(torch.zeros(3, 3))
    ckpt.read(path).assert_consumed()
    assert plain.read_value().tolist() == [1.0, 2.0]
    assert torch.equal(sharded.read_value(), torch.arange(9.0).view(3, 3))
    # the whole logical value: restores into another number of shards
    other = sj.ShardedVariable([sj.Variable(torch.zeros(1, 3)) for _ in range(3)])
    train.Checkpoint(sharded=other).read(path).expect_partial()
    assert torch.equal(other.read_value(), torch.arange(9.0).view(3, 3))


def test_mirrored_and_sync_on_read_variables(tmp_path):
    strategy = sj.MirroredStrategy(["cpu:0", "cpu:1"])
    with strategy.scope():
        mirrored = sj.Variable(torch.tensor([1.0, 2.0]))
        summed = sj.Variable(
            torch.tensor(0.0),
            synchronization=sj.VariableSynchronization.ON_READ,
            aggregation=sj.VariableAggregation.SUM,
        )
    assert isinstance(mirrored, MirroredVariable) and isinstance(summed, SyncOnReadVariable)
    strategy.run(lambda: summed.assign_add(torch.tensor(1.5)))  # 1.5 on each replica
    ckpt = train.Checkpoint(m=mirrored, s=summed)
    path = ckpt.write(tmp_path / "d")
    mirrored.assign(torch.zeros(2))
    with strategy.scope():
        summed.assign(torch.tensor(0.0))
    ckpt.read(path).assert_consumed()
    assert [c.read_value().tolist() for c in mirrored.values] == [[1.0, 2.0], [1.0, 2.0]]
    with strategy.scope():
        assert summed.read_value().item() == 3.0  # the saved value is the cross-replica sum


def test_load_statuses(tmp_path, caplog):
    path = train.Checkpoint(a=torch.ones(1), b=torch.ones(1)).write(tmp_path / "s")
    status = train.Checkpoint(a=torch.zeros(1)).read(path)
    status.assert_existing_objects_matched().assert_nontrivial_match()
    with pytest.raises(AssertionError, match=r"Unresolved object in checkpoint .*\(root\)\.b"):
        status.assert_consumed()
    status.expect_partial()

    status = train.Checkpoint(a=torch.zeros(1), c=torch.zeros(1)).read(path)
    with pytest.raises(AssertionError, match=r"not bound to checkpointed values.*\(root\)\.c"):
        status.assert_existing_objects_matched()
    with pytest.raises(AssertionError, match="matched none"):
        train.Checkpoint(z=torch.zeros(1)).read(path).expect_partial().assert_nontrivial_match()

    with caplog.at_level(logging.WARNING, logger="strategyjob.train.checkpoint"):
        train.Checkpoint(a=torch.zeros(1)).read(path)  # status dropped, b never restored
    assert "(root).b" in caplog.text and "expect_partial" in caplog.text

    none = train.Checkpoint(a=torch.zeros(1)).restore(None)
    none.expect_partial().initialize_or_restore()
    with pytest.raises(AssertionError, match=r"No checkpoint specified \(save_path=None\)"):
        none.assert_consumed()


def test_bad_input_one_clear_line(tmp_path):
    with pytest.raises(ValueError, match="expecting a trackable object for 'x'") as e:
        train.Checkpoint(x=object())
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match=r"'d\.k'"):
        train.Checkpoint(d={"k": object()})
    with pytest.raises(ValueError, match=r"'save_counter'.*Checkpoint's own API"):
        train.Checkpoint(save_counter=1)
    with pytest.raises(ValueError, match=r"'_write'.*starting with '_'"):
        train.Checkpoint(_write=torch.zeros(1))
    ckpt = train.Checkpoint(t=torch.zeros(2))
    # TensorFlow's error classes, which are also the Python ones code may already catch.
    with pytest.raises(errors.NotFoundError, match="no such file") as missing:
        ckpt.restore(tmp_path / "missing")
    assert isinstance(missing.value, FileNotFoundError)
    with pytest.raises(ValueError, match=r"is a directory.*latest_checkpoint"):
        ckpt.restore(tmp_path)
    (tmp_path / "garbage").write_bytes(b"not a checkpoint")
    with pytest.raises(errors.DataLossError, match=r"Failed to read checkpoint .*garbage") as e:
        ckpt.restore(tmp_path / "garbage")
    assert "\n" not in str(e.value) and isinstance(e.value, ValueError)
    torch.save({"x": 1}, tmp_path / "plain.pt")
    with pytest.raises(errors.DataLossError, match=r"not a strategyjob.train.Checkpoint file"):
        ckpt.restore(tmp_path / "plain.pt")
    path = ckpt.write(tmp_path / "ok")
    with pytest.raises(ValueError, match=r"incompatible tensor with shape \[2\].*shape \[3\]"):
        train.Checkpoint(t=torch.zeros(3)).restore(path)
    with pytest.raises(ValueError, match=r"holds a tensor for \(root\)\.t.*state_dict"):
        train.Checkpoint(t=nn.Linear(1, 1)).restore(path)


def test_only_the_final_file_is_left(tmp_path):
    """An atomic write leaves no temporary file behind, even when the write itself fails."""
    ckpt = train.Checkpoint(bad={"f": torch.ones(1)})
    ckpt.write(tmp_path / "good")

    class Unpicklable:
        def state_dict(self):
            return {"lock": __import__("threading").Lock()}

        def load_state_dict(self, state):
            pass

    ckpt.oops = Unpicklable()
    with pytest.raises(Exception, match="pickle"):
        ckpt.write(tmp_path / "bad")
    assert sorted(os.listdir(tmp_path)) == ["good"]


def test_writing_in_a_replica_context_is_refused(tmp_path):
    strategy = sj.MirroredStrategy(["cpu:0", "cpu:1"])
    ckpt = train.Checkpoint(t=torch.zeros(1))
    with pytest.raises(RuntimeError, match=r"replica context .*Save after `strategy\.run`"):
        strategy.run(lambda: ckpt.write(tmp_path / "x"))
    assert os.listdir(tmp_path) == []
    with strategy.scope():  # cross-replica context: fine
        ckpt.write(tmp_path / "y")
    assert os.listdir(tmp_path) == ["y"]


def test_a_copy_keeps_its_own_objects_and_counter(tmp_path):
    """A Checkpoint's own state is kept apart from its attributes (the tracked objects); a deep
    copy gets a copy of it, independent of the original."""
    ckpt = train.Checkpoint(t=torch.ones(2), n=1)
    ckpt.save(tmp_path / "a")
    copied = copy.deepcopy(ckpt)
    copied.t.fill_(7.0)
    copied.n = 2
    assert copied.save(tmp_path / "b") == str(tmp_path / "b-2")
    assert int(ckpt.save_counter) == 1 and ckpt.n == 1 and torch.equal(ckpt.t, torch.ones(2))
    assert (
        "t" in dir(copied) and repr(copied) == "<strategyjob.train.Checkpoint objects=['t', 'n']>"
    )
    ckpt.restore(tmp_path / "b-2").assert_consumed()
    assert (ckpt.n, int(ckpt.save_counter)) == (2, 2) and torch.equal(ckpt.t, torch.full((2,), 7.0))


def test_a_checkpoint_in_a_reference_cycle_is_collected():
    """Nothing outside a Checkpoint keeps it (or the objects it tracks) alive: a parent and a
    child tracking each other go once unreachable."""
    parent = train.Checkpoint(t=torch.ones(1))
    child = train.Checkpoint(u=torch.ones(1))
    parent.child, child.parent = child, parent
    gone = weakref.ref(parent)
    del parent, child
    gc.collect()
    assert gone() is None
