-- Where the receipt a recipient's delivery was last taken from came from: the provider's name, or
-- 'one_click' when the recipient used the message's unsubscribe link (which proves the message reached
-- them). A recipient recorded unknown that such evidence proves sent is audited with what the evidence was,
-- not as a receipt it never had. NULL for receipts recorded before.
ALTER TABLE campaign_recipients ADD COLUMN delivery_via text;
