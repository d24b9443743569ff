"""What tests share: live sites and their clients, model servers, helpers of each layer."""
