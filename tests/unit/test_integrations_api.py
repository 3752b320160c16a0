"""slimpar.integrations changes steps of transformers.Trainer, Accelerate and Lightning's DDPStrategy, some of them
private (pinned: slimpar[hf], slimpar[lightning]). Their names and parameters are checked here, so an upgrade that
renames or reshapes one fails this test instead of silently training without SDP's averaging."""

import inspect


def _params(fn) -> list[str]:
    return list(inspect.signature(fn).parameters)[1:]  # without self


def test_the_trainer_steps_sdp_trainer_overrides():
    from transformers import Trainer

    assert _params(Trainer.create_optimizer) == ["model"]
    assert _params(Trainer._wrap_model) == ["model", "training", "dataloader"]
    assert _params(Trainer.training_step) == ["model", "inputs", "num_items_in_batch"]
    assert _params(Trainer._clip_grad_norm) == ["model"]
    assert _params(Trainer._get_grad_norm) == ["model", "grad_norm"]
    assert _params(Trainer.save_model) == ["output_dir", "_internal_call"]
    assert _params(Trainer._save_optimizer_and_scheduler) == ["output_dir"]
    assert _params(Trainer._load_from_checkpoint) == ["resume_from_checkpoint", "model"]
    assert _params(Trainer._load_optimizer_and_scheduler) == ["checkpoint"]
    # Trainer skips Accelerate's prepare for a model its _wrap_model changed: that is how SDPTrainer avoids DDP
    assert "use_accelerator_prepare = model is self.model" in inspect.getsource(Trainer._prepare_for_training)


def test_accelerate_passes_a_marked_module_through_and_reaches_its_no_sync():
    from accelerate import Accelerator

    assert 'getattr(model, "_is_accelerate_prepared", False)' in inspect.getsource(Accelerator.prepare_model)
    assert 'getattr(model, "no_sync", context)' in inspect.getsource(Accelerator.no_sync)


def test_the_lightning_extension_points_sdp_strategy_uses():
    from lightning.pytorch.plugins.precision import Precision
    from lightning.pytorch.strategies import DDPStrategy

    for hook in ("configure_ddp", "setup_precision_plugin", "block_backward_sync", "on_validation_start",
                 "on_validation_end", "on_test_start", "on_test_end", "on_predict_start", "on_predict_end"):
        assert _params(getattr(DDPStrategy, hook)) == [], hook
    assert _params(DDPStrategy.post_backward) == ["closure_loss"]
    assert _params(DDPStrategy.optimizer_step)[:3] == ["optimizer", "closure", "model"]
    assert _params(DDPStrategy.optimizer_state) == ["optimizer"]
    assert _params(DDPStrategy.load_optimizer_state_dict) == ["checkpoint"]
    assert _params(DDPStrategy.lightning_module_state_dict) == []
    assert _params(Precision.clip_grad_by_norm) == ["optimizer", "clip_val"]
    assert "self.configure_ddp()" in inspect.getsource(DDPStrategy.setup)
