"""Learning from collected episodes: SFT (:mod:`.sft`) and DPO (:mod:`.dpo`) through TRL's trainers
on token-faithful rows built from trajectories (:mod:`.data`), and TRL's online ``GRPOTrainer`` on
agentgym envs (:mod:`.trl_adapter`). ``trl`` itself is imported only when these run."""
